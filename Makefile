# Two commands: `make demo` and `make test`. Each creates .venv on first use and again
# whenever pyproject.toml changes (the stamp depends on it).

VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The exact torch pin from pyproject.toml: installed on its own first so pip takes the CPU
# wheel that pin names instead of resolving torch together with everything else.
TORCH  := $(shell grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')

.PHONY: demo test explore bench lint graphviz fuzz mutate

demo: $(STAMP) graphviz
	$(PY) -m fspyre demo

# pytest-xdist: one worker per CPU (work stealing evens out the long tests: the model zoo, the
# properties); golden journal writes take a lock, hypothesis's example database writes atomically,
# and everything else a test writes is under its own tmp_path.
test: $(STAMP) graphviz
	$(PY) -m pytest -n auto --dist worksteal tests

# The same suite with hypothesis drawing new examples (`make test` draws the same ones each
# run, so it passes or fails reproducibly): `make explore`, or `make explore SEED=7` to repeat
# a draw; HYPOTHESIS_PROFILE=deep draws 25x as many.
explore: $(STAMP) graphviz
	HYPOTHESIS_PROFILE=$(or $(HYPOTHESIS_PROFILE),explore) $(PY) -m pytest -n auto --dist worksteal \
		$(if $(filter command line,$(origin SEED)),--hypothesis-seed=$(SEED)) tests

# The random-program campaign (fspyre/testing/campaign): `make fuzz N=2000 SEED=0 WORKERS=2`, on this
# host's processes; `fspyre campaign --ray` (or `--address`, `--shard i/N`) spreads it further.
N       ?= 1000
SEED    ?= 0
WORKERS ?= 2
fuzz: $(STAMP)
	$(PY) -m fspyre campaign --count $(N) --seed $(SEED) --workers $(WORKERS)

# The mutation check (fspyre/testing/mutation.py), outside `make test`: one change at a time to
# the rules of each of its six modules, each run against that module's own tests, all modules
# within BUDGET minutes (an equal share each). `make mutate MUTANTS=8 BUDGET=20`.
MUTANTS ?= 8
BUDGET  ?= 20
mutate: $(STAMP)
	$(PY) -m fspyre.testing.mutation --per-module $(MUTANTS) --seed $(SEED) --budget-minutes $(BUDGET)

bench: $(STAMP)
	$(PY) benchmarks/compile_time.py
	$(PY) benchmarks/interpreter_time.py
	$(PY) benchmarks/tiling.py

# mypy reads its settings (files, the untyped libraries it treats as Any) from pyproject.toml.
lint: $(STAMP)
	$(VENV)/bin/ruff check fspyre tests benchmarks
	$(VENV)/bin/mypy

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

# Graphviz's `dot` draws the loop-tree pictures. Installed when missing and we are root;
# otherwise (or if apt cannot reach its mirror) the pictures are skipped, never failed.
graphviz:
	@command -v dot >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -qq graphviz >/dev/null 2>&1 \
	      || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq graphviz >/dev/null 2>&1; } \
	      || echo "note: could not install graphviz; pictures will be skipped"; \
	  else \
	    echo "note: graphviz's dot is missing (apt-get install graphviz as root); pictures will be skipped"; \
	  fi; }
