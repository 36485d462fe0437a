Magic link example
