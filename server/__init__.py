"""capwatch's protocol edge: the command line, and (later) the gRPC services."""
