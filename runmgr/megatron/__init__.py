"""Driving a Megatron-LM / MindSpeed-LLM job: its arguments, the flags each plan
becomes, the flavor's abilities and the command line of each node (pure: no Ray)."""
