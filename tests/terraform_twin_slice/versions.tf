terraform {
  required_version = ">= 1.9.0, < 2.0.0"
}
