"""`python -m flashgen.tl_spec.library`: re-render the committed library programs."""

from flashgen.tl_spec.library import write_all

for path in write_all():
    print(path)
