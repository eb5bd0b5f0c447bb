"""Lake Query's native DoGet data plane (pyarrow's C++ Flight server in the Query process)."""
