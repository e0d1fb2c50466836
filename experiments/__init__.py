"""The science: claims, learning runs, sweeps, world-model cells (speed, memory and scale
benchmarks are in bench/). Each module is `python -m experiments.NAME --help`; results go to
bench/results/ like every measurement."""
