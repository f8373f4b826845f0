"""The daemon that runs inside every sandbox. Standard library only: it runs on the sandbox's python3."""
