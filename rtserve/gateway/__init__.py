"""The pod's gateway: nginx's config, the key sync that feeds it, the OIP model routes behind it."""
