"""``python -m archive_manager``: the same as the ``archive-manager`` console script."""

from .cli import main

if __name__ == "__main__":
    main()
