"""Operator tools beside `spool serve`: `spool share-groups`, `spool topics` and `spool
configs`, with the flags, validation and output of Kafka's kafka-share-groups.sh,
kafka-topics.sh and kafka-configs.sh. Each module registers its subcommand through
`broker.cli.TOOL_MODULES`; the admin client they use is `protocol.admin`."""
