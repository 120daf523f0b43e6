"""Side effects once per key: a claim with a lease and a fencing token, and a stored result."""
