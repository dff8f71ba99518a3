"""Dashboard widgets, one module per screen region."""
