"""Producer ids: InitPid issues them and holds each one's current epoch."""
