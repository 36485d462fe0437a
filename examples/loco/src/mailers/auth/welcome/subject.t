Welcome {{name}}
