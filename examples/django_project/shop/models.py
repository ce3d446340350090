from django.db import models


class Order(models.Model):
    reference = models.CharField(max_length=64, unique=True)
    confirmed = models.BooleanField(default=False)
    job_id = models.CharField(max_length=64, blank=True)
