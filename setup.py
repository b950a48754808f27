"""keyedstate: a RocksDB-backed, Python-owned state store provider for Spark Structured Streaming."""
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildPyWithShimSources(build_py):
    """Ship the JVM shim sources inside the package, so a wheel can build its jar on first use."""

    def run(self):
        super().run()
        if self.editable_mode:
            return
        src = Path("jvm_bridge/src/main/scala")
        for path in src.rglob("*.scala"):
            self.copy_file(str(path), str(Path(self.build_lib, "keyedstate", "_jvm_bridge", path.relative_to(src))),
                           preserve_mode=False)


setup(
    name="keyedstate",
    version="0.1.0",
    description="Flink-grade keyed state (RocksDB, key groups, incremental snapshots) for Spark Structured Streaming",
    long_description=Path("README.md").read_text(encoding="utf-8") if Path("README.md").exists() else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",
    packages=["keyedstate"] + [f"keyedstate.{p}" for p in find_packages("provider")],
    package_dir={"keyedstate": "provider"},
    install_requires=[
        "pyspark==4.3.*",
        "py4j>=0.10.9.9",
        "rocksdict>=0.3.29",
        "cloudpickle>=2.1",
        "numpy>=1.23",  # the offline rescale routes fixed-width changelog records vectorised
        "zstandard>=0.22",  # changelogs are zstd frames (the JVM writes them with Spark's zstd-jni)
    ],
    extras_require={
        # pandas 3 is not supported by PySpark 4.3 (it warns, and applyInPandas* may misbehave)
        "test": ["pytest>=8", "pytest-benchmark>=4", "pytest-timeout>=2", "pytest-xdist>=3.6,<4", "hypothesis>=6",
                 "pandas>=2,<3", "pyarrow>=15",
                 "moto[server]>=5"],  # tests/storage: an S3 API server on loopback for s3a://
        "bench": ["pytest-benchmark>=4", "matplotlib>=3.8", "pandas>=2,<3", "pyarrow>=15"],
    },
    entry_points={"console_scripts": ["keyedstate=keyedstate.cli:main"]},
    package_data={"keyedstate.shim": ["*.properties"]},
    cmdclass={"build_py": BuildPyWithShimSources},
    classifiers=[
        "Programming Language :: Python :: 3.11",
        "Topic :: Database",
        "License :: OSI Approved :: Apache Software License",
    ],
)
