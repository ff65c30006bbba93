"""``python -m archive_manager.cli``: the same as the ``archive-manager`` console script."""

from . import main

if __name__ == "__main__":
    main()
