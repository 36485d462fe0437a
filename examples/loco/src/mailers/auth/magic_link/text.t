Magic link with this link: 
{{host}}/api/auth/magic-link/{{token}}