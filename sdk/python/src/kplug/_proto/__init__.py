"""Generated gRPC stubs. Regenerate with sdk/python/generate.sh; do not edit."""
