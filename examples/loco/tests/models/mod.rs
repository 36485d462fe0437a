mod users;
