"""The wire: message schemas and codec, sockets, CURVE security, the shared-memory slot ring. The
only folder that imports zmq or touches /dev/shm."""
