from everyo.cli import main

raise SystemExit(main())
