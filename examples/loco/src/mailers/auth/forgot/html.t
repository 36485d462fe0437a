;<html>

<body>
  Hey {{name}},
  Forgot your password? No worries! You can reset it by clicking the link below:
  <a href="{{host}}/reset#{{resetToken}}">Reset Your Password</a>
  If you didn't request a password reset, please ignore this email.
  Best regards,<br>The Loco Team</br>
</body>

</html>
