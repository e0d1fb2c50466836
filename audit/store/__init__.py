"""The audit's files: typed records, reading a stored audit back, the one writer, the report."""
