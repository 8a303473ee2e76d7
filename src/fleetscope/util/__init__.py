"""Small shared helpers every stage may use: rate-limited warnings, secret redaction."""
