"""The gRPC surface: servicers, proto conversion and the error-to-status table."""
