"""envace audit: replay rehearsed tool responses against a real environment and score them.

Never imports torch: an audit runs on a laptop over files produced on a GPU cluster.
"""
