from burnout.cli import main

raise SystemExit(main())
