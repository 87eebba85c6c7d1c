from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_jobs', '0010_mysql_binary_collation'),
    ]

    operations = [
        migrations.CreateModel(
            name='Lease',
            fields=[
                ('name', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('holder', models.CharField(blank=True, default='', max_length=200)),
                ('expires_at', models.DateTimeField(blank=True, null=True)),
                ('counter', models.BigIntegerField(default=0)),
            ],
            options={
                'db_table': 'django_jobs_lease',
            },
        ),
    ]
