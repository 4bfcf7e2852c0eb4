"""The Terraform module the session tests run (tests/fast and tests/integration)."""

from __future__ import annotations

MODULE = """
resource "terraform_data" "first" {
  input = "first"
  provisioner "local-exec" {
    command = "touch ${path.module}/first-started; sleep 3"
  }
}

resource "terraform_data" "second" {
  input      = "second"
  depends_on = [terraform_data.first]
}
"""
