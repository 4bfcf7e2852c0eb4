terraform {
  # 1.9: variable validations may refer to other variables (zone within region).
  required_version = ">= 1.9.0, < 2.0.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.37.0, < 8.0.0"
    }
    # google_tpu_v2_vm exists only in the beta provider (scheduling_config.spot: March 2025).
    google-beta = {
      source  = "hashicorp/google-beta"
      version = ">= 6.37.0, < 8.0.0"
    }
    # The custom role's ID suffix: a deleted custom role's ID stays taken for up to 37 days.
    random = {
      source  = "hashicorp/random"
      version = ">= 3.6.0, < 4.0.0"
    }
    # time_sleep: the wait after a new service account (modules/service_account).
    time = {
      source  = "hashicorp/time"
      version = ">= 0.11.0, < 1.0.0"
    }
  }
}
