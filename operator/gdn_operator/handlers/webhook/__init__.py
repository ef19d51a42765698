"""The webhooks: GDNModelServer admission, webhook configurations, the bounded webhook server, serving certificates, the operator's side of the front process."""
