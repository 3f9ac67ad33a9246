from hiveroute.cli import main

raise SystemExit(main())
