"""What the benchmarks share that is not itself a benchmark (each script in
``benchmarks/`` ends by printing one line of JSON; these modules print nothing)."""
