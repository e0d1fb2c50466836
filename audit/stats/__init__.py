"""Statistics of an audit: intervals, compounding, real vs own history, which steps count,
the summary."""
