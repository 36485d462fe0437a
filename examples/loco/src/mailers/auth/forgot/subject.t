Your reset password link
