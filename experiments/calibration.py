from cbdp_jax.experiments._common import script_main

if __name__ == "__main__":
    script_main("calibration")
