"""Pure math of asyncrl (torch only): returns (V-trace, GAE), policy losses, distributions."""
