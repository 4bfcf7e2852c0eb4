"""Local stand-ins for the cloud services the tests cannot reach; each speaks the real wire format.

    from testbed.fakes.tpu_api import FakeTpuApi
    from testbed.fakes.gcs import GcsSandbox  # TensorFlow's own gs:// against a fake, for real
"""
