"""The ``vllm.general_plugins`` entry point. vLLM calls :func:`register` in each of its
processes; it only records where the connector lives (vLLM imports it when a
``--kv-transfer-config`` names ``PegaKVConnector``), so an installed pegaflow costs nothing
and checks nothing in vLLM deployments that do not use it."""


def register() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if "PegaKVConnector" in KVConnectorFactory._registry:
        return  # vLLM loads plugins once per process, but a second call must not raise
    KVConnectorFactory.register_connector("PegaKVConnector", "pegaflow.connector", "PegaKVConnector")
