from tiny_llm.cli import main

raise SystemExit(main())
