"""Any MCP server as an envace environment (`mcp:<profile>`): see env.py and docs/mcp.md."""
