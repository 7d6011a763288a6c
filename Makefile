# Every target sets up .venv itself (tools/ensure-venv): `make demo` and `make test` are all
# a fresh machine needs.
.PHONY: demo test validate bench docs clean

demo:
	@tools/ensure-venv
	.venv/bin/dpinfer demo

test:
	@tools/ensure-venv
	@tools/ensure-chromium
	.venv/bin/python -m pytest -q -n 2 --dist loadfile

validate:
	@tools/ensure-venv
	.venv/bin/python -m pytest -q -m validation -s

bench:
	@tools/ensure-venv
	.venv/bin/python benchmarks/bench_beta_binomial.py
	.venv/bin/python benchmarks/bench_county.py
	.venv/bin/python benchmarks/bench_invariants.py
	.venv/bin/python benchmarks/bench_subspace.py
	.venv/bin/python benchmarks/bench_dapper.py

docs:
	@tools/ensure-venv
	.venv/bin/mkdocs build --strict

clean:
	rm -rf .venv build *.egg-info site
