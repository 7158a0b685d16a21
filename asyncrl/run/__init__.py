"""Ways to run the roles: serial mode (one process), the local supervisor (`asyncrl run`) and Ray."""
