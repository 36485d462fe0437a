Reset your password with this link:

{{host}}/reset#{{resetToken}}
