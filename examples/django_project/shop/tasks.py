"""A plain ``@shared_task`` that uses the ORM: with ``keel.install`` it is a Keel job."""

from celery import shared_task

from shop.models import Order


@shared_task
def confirm(reference):
    updated = Order.objects.filter(reference=reference).update(confirmed=True)
    return {"confirmed": updated}
