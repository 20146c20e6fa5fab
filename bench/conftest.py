"""pytest-benchmark suite. Each benchmark times a native loop of many operations, so the
figure pytest-benchmark reports is for the whole loop; ``extra_info['ns_per_op']`` holds the
per-operation cost."""
