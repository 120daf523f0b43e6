"""Settings, database access, error mapping and the app factory shared by every domain."""
