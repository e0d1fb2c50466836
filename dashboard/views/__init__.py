"""The dashboard pages (Streamlit page scripts run by ``dashboard/app.py``)."""
