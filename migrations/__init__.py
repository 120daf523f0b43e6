"""Alembic migrations: the only way the store's schema changes. Shipped inside the package so an
installed `coordinator migrate` finds them; `alembic -c migrations/alembic.ini upgrade head` works
from a checkout."""
