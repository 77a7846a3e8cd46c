"""`python -m fp8mix`: the command-line tools (fp8mix.tools.cli), imported only here."""


def _main() -> int:
    from fp8mix.tools.cli import main

    return main()


raise SystemExit(_main())
