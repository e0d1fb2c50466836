"""envace dashboard: Streamlit pages over run and audit directories. Never imports torch."""
