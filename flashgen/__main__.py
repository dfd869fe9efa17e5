"""`python -m flashgen`: the `flashgen` command."""

from flashgen.cli import main

main()
