"""The pod's authenticating gateway: nginx's config and the key sync that feeds it."""
