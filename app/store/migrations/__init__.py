"""Alembic migrations of the call store; app/store/db.py runs them (`upgrade head`) at start-up."""
