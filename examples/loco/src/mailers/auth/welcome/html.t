;<html>

<body>
  Dear {{name}},
  Welcome to Loco! You can now log in to your account.
  Before you get started, please verify your account by clicking the link below:
  <a href="{{host}}/api/auth/verify/{{verifyToken}}">
    Verify Your Account
  </a>
  <p>Best regards,<br>The Loco Team</p>
</body>

</html>
