"""``runmgr lint``: the hyper-parameter, data and software mistakes that seeds
000 and 004 and OPT's Run 11/12 lessons name, checked before a run starts
(docs/lint.md). Each rule is a pure function of what it reads (the typed
config, a decoded sample of the data, a checkpoint's manifest, the health
check's report) and returns findings; launch and the CLI act on them."""
