Welcome {{name}}, you can now log in.
  Verify your account with the link below:

  {{host}}/api/auth/verify/{{verifyToken}}
