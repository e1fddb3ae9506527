"""``python -m rankrun`` and the ``rankrun`` console script.

The death-signal catcher is installed before anything else is imported, so a signal that
arrives while the launcher is still starting is recorded, never fatal.
"""

from rankrun.proc.early import EarlyCatcher


def main_exit() -> None:
    catcher = EarlyCatcher.install()
    import sys  # noqa: PLC0415

    # asyncio imports ssl eagerly (about 4 MB resident, 13 ms); the launcher speaks no TLS, and
    # asyncio works without it. Workers are fresh interpreters and are not affected.
    sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]

    from rankrun.cli import main  # noqa: PLC0415 - after the catcher, on purpose

    sys.exit(main(catcher=catcher))


if __name__ == "__main__":
    main_exit()
